// Entry point of the `pipetrain` executable.
#include "apps/commands.h"

int main(int argc, char** argv) { return pipetrain::apps::run_cli(argc, argv); }
