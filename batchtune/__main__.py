from batchtune.cli import main

main()
