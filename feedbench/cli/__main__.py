from feedbench.cli import main

main()
