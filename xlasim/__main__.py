from xlasim.cli.commands import main

raise SystemExit(main())
