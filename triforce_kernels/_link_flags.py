"""Link flags that keep the C++ extension on the process's shared libstdc++ (setup.py and tests read this).

A compiler that links libstdc++ statically (a wrapper adding ``-static-libstdc++`` does) puts a second copy
of it in the extension. That copy's iostreams look torch's locale facets up with their own ids, so
formatting a number in an error message (``TORCH_CHECK(ok, "got ", n)``) drops the number or crashes the
process. ``-lstdc++``, named before the driver's own libraries, resolves every libstdc++ symbol from the
shared library first; ``--exclude-libs,ALL`` keeps whatever still comes from a static archive (libgcc's
helpers) private to the extension. Not this file's concern elsewhere than Linux.
"""
import sys


def libstdcxx_link_flags() -> list[str]:
    return ["-lstdc++", "-Wl,--exclude-libs,ALL"] if sys.platform.startswith("linux") else []
