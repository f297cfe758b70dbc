"""Link flags that keep the C++ extension safe from a compiler that links libstdc++ statically
(setup.py and tests read this).

A compiler that links libstdc++ statically (the GPU image's g++ wrapper does, like ``-static-libstdc++``)
puts a second copy of it in the extension. Exported, that copy's code mixed its own locale data with the
process's (torch's) libstdc++, so formatting a number in an error message (``TORCH_CHECK(ok, "got ", n)``)
dropped the number here and crashed the process on the GPU image. ``--exclude-libs,ALL`` makes every
symbol that comes from a static archive local to the extension, so such a copy is private and consistent:
that is the fix that ran there. ``-lstdc++``, named before the driver's own libraries, asks for the shared
library first; some drivers honour it (g++ 12 here links libstdc++.so then), the image's did not.
Only Linux builds take these flags.
"""
import sys


def libstdcxx_link_flags() -> list[str]:
    return ["-lstdc++", "-Wl,--exclude-libs,ALL"] if sys.platform.startswith("linux") else []
