from canzona.cli import main

raise SystemExit(main())
