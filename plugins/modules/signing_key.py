#!/usr/bin/python
# Copyright: gpuinfra maintainers
# Apache License 2.0 (see LICENSE)
"""Check that a package signing key file holds exactly one key, the pinned one, before apt or dnf sees it."""

from __future__ import annotations

import tempfile

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: signing_key
short_description: Check a package signing key against its pinned fingerprint
description:
  - Lists the keys in a signing key file with C(gpg --show-keys), in a throwaway gpg home, without importing them.
  - Fails unless the file holds exactly one primary key and its fingerprint is the pinned one; the message names
    both fingerprints. A keyring with the pinned key and another would let apt trust both, so it fails too.
  - Changes nothing, so it runs in check mode as well.
options:
  path:
    description: The key file on the host, armored or binary.
    type: path
    required: true
  fingerprint:
    description: The pinned fingerprint, 40 upper-case hex digits.
    type: str
    required: true
  origin:
    description: Where the key came from, for the message (a URL or a file on the controller).
    type: str
requirements: [gpg]
author: gpuinfra maintainers
"""

EXAMPLES = r"""
- name: Check that the mirror's signing key is the pinned one
  gpuinfra.cluster.signing_key:
    path: /var/lib/gpuinfra/keys/nvidia-driver.asc
    fingerprint: EB693B3035CD5710E231E123A4B469963BF863CC
    origin: keys/cuda-archive-keyring.gpg
"""

RETURN = r"""
fingerprints:
  description: The fingerprints of the primary keys in the file, in file order.
  type: list
  elements: str
  returned: always
"""


def primary_fingerprints(colon_listing: str) -> list[str]:
    """Fingerprints of the primary keys in `gpg --with-colons` output: the `fpr` line (field 10) after each `pub`."""
    found: list[str] = []
    after_pub = False
    for line in colon_listing.splitlines():
        fields = line.split(":")
        if fields[0] == "pub":
            after_pub = True
        elif fields[0] == "fpr" and after_pub and len(fields) > 9:
            found.append(fields[9])
            after_pub = False
    return found


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "path": {"type": "path", "required": True},
            "fingerprint": {"type": "str", "required": True},
            "origin": {"type": "str"},
        },
        supports_check_mode=True,
    )
    path, pinned = module.params["path"], module.params["fingerprint"]
    origin = module.params["origin"] or path
    with tempfile.TemporaryDirectory(prefix="gpuinfra-gnupg-") as home:
        rc, out, err = module.run_command(
            ["gpg", f"--homedir={home}", "--batch", "--no-tty", "--with-colons", "--show-keys", path]
        )
    found = primary_fingerprints(out) if rc == 0 else []
    if found != [pinned]:
        seen = " and ".join(found) if found else f"of no key (gpg: {' '.join(err.split())})"
        module.fail_json(
            msg=f"The signing key {origin} has the fingerprint {seen}, but {pinned} is pinned for it, so it was not "
            "installed. Check the key with its publisher; if it was rightly replaced, pin the new fingerprint.",
            fingerprints=found,
        )
    module.exit_json(changed=False, fingerprints=found)


if __name__ == "__main__":
    main()
