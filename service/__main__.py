from __future__ import annotations

from service.cli import main

raise SystemExit(main())
