from specrt.cli import main

main()
