from pyscheduler.cli import main

main()
