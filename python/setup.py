"""pip install ./python (after `make`): the pure-Python package kvps, with the libkvps.so that
`make` built (build/libkvps.so, or $KVPS_LIB) copied beside it. Nothing is compiled here.
No pyproject.toml on purpose: pip then builds with the setuptools already installed, offline."""
import os

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))


class build_py_with_lib(build_py):
    """Also copies libkvps.so into the package (kvps/libkvps.so, where kvps looks first)."""

    def run(self):
        super().run()
        lib = os.environ.get("KVPS_LIB") or os.path.join(HERE, "..", "build", "libkvps.so")
        if os.path.exists(lib):
            self.copy_file(lib, os.path.join(self.build_lib, "kvps", "libkvps.so"))
        else:
            print("kvps: no libkvps.so at %s (run `make` first, or set KVPS_LIB): the package will look for it "
                  "with $KVPS_LIB or on the loader's path at import" % lib)


setup(
    name="kvps",
    version="0.2",
    description="kvps from Python: collectives, parameter-server workers and servers over libkvps.so (ctypes)",
    packages=["kvps", "kvps.torch"],
    python_requires=">=3.7",
    install_requires=["numpy"],
    cmdclass={"build_py": build_py_with_lib},
    zip_safe=False,
)
