from xlasim.cli import main

raise SystemExit(main())
