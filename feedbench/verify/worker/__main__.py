from feedbench.verify.worker.main import main

main()
