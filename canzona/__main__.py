from canzona.commands.cli import main

raise SystemExit(main())
