// The README's library example: it must compile against the installed package and run.
#include <pipetrain/pipetrain.h>

#include <iostream>

int main() {
  std::cout << "pipetrain " << PIPETRAIN_VERSION << "\n";
  std::cout << pipetrain::util::describe_blas(pipetrain::util::blas_info()) << "\n";
  return 0;
}
