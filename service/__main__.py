from __future__ import annotations

from service.commands.cli import main

raise SystemExit(main())
