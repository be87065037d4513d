"""``python -m headcount`` runs the ``headcount`` command."""

from headcount.cli.main import main

raise SystemExit(main())
