"""Turn a resolved cluster into Ansible inventory and vars, and render the roles' templates for `plan`."""
