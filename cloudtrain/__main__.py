from cloudtrain.cli.main import main

main()
