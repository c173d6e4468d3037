#!/usr/bin/env bash
# Rebuild memsave's C++/CUDA extension in place while editing it (editable install, ninja + ccache, serialised by a
# lock so that two builds in one tree never overlap). Same build as tools/setup.sh, forced.
#   MEMSAVE_CUDA=OFF bash tools/dev_build.sh    # CPU kernels only (faster while iterating)
exec bash "$(dirname "$0")/setup.sh" --rebuild
