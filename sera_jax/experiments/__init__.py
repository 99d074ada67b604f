"""What drives several rooms at once: the tiny default's four phases (``default_run``), ``sera-ablate``'s sweep of
methods × seeds (``ablate``) and ``sera-train --dry-run`` (``dry_run``)."""
