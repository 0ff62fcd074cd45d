// patchgen: generates patched modeling files from YAML specs (docs/cli.md).
#include "cli.h"

int main(int argc, char** argv) { return patchgen::cli::Run(argc, argv); }
