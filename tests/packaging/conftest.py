def pytest_addoption(parser):
    parser.addoption("--patchgen", required=True, help="the patchgen binary that generates the scratch outputs")
