"""`pip install --no-build-isolation .`: builds pipetrain's Python package with CMake and installs it.

The extension (pipetrain._C) and libpipetrain.so are built by the project's CMake, in ./build when
it has been configured (scripts/build.sh), else in ./build-pip, for the Python that runs pip; both
files are copied into the installed package, which finds the library beside the extension.
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, find_packages, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
VERSION = re.search(r'project\(pipetrain VERSION ([0-9.]+)', (ROOT / 'CMakeLists.txt').read_text()).group(1)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build = pathlib.Path(os.environ.get('PIPETRAIN_BUILD_DIR', ROOT / 'build'))
        if not build.is_absolute():
            build = ROOT / build
        if not (build / 'CMakeCache.txt').exists():
            build = ROOT / 'build-pip'
            generator = ['-G', 'Ninja'] if shutil.which('ninja') else []
            subprocess.run(['cmake', '-S', str(ROOT), '-B', str(build), *generator, '-DCMAKE_BUILD_TYPE=Release',
                            '-DPIPETRAIN_PYTHON=ON', f'-DPIPETRAIN_PYTHON_EXECUTABLE={sys.executable}',
                            '-DPIPETRAIN_BUILD_TESTS=OFF', '-DPIPETRAIN_BUILD_BENCH=OFF'], check=True)
        subprocess.run(['cmake', '--build', str(build), '--target', 'pipetrain_python', '-j', str(os.cpu_count() or 1)],
                       check=True)
        target = pathlib.Path(self.get_ext_fullpath(ext.name))
        target.parent.mkdir(parents=True, exist_ok=True)
        built = sorted((build / 'python' / 'pipetrain').glob('_C*.so'))
        if not built:
            raise RuntimeError(f'CMake built no pipetrain._C in {build}/python/pipetrain')
        shutil.copy2(built[0], target)
        library = (build / 'libpipetrain.so').resolve()
        shutil.copy2(library, target.parent / f'libpipetrain.so.{VERSION.split(".")[0]}')


setup(
    name='pipetrain',
    version=VERSION,
    description="Pipeline-parallel training on a native C++ runtime: torchgpipe's and DeepSpeed's APIs",
    packages=find_packages('python'),
    package_dir={'': 'python'},
    ext_modules=[Extension('pipetrain._C', sources=[])],
    cmdclass={'build_ext': CMakeBuild},
    python_requires='>=3.8',
)
