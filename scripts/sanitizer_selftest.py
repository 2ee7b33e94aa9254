"""A planted out-of-bounds write through gg's own compile + launch path. scripts/gpu_check.sh runs
it under compute-sanitizer memcheck and expects an error: proof that the sanitizer really sees
gg's kernels, so its "0 errors" on the test suite means something."""
import numpy as np

from gg.backends.cuda import compiler, runtime
from gg.backends.cuda.launch import Args, Launch

SRC = 'extern "C" __global__ void oob(float* p, int n) { p[threadIdx.x + n] = 1.0f; }'


def main() -> None:
    rt = runtime.get()
    cubin = compiler.compile_source(SRC, "oob.cu", rt.arch, use_cache=False)
    rt.add_module("oob.cu", cubin)
    buf = rt.alloc(64 * 4)
    Launch(rt, "oob.cu", "oob", (1, 1, 1), (64, 1, 1), Args().ptr(buf.ptr).i32(64 * 1024 * 1024))()
    try:
        rt.synchronize("the planted fault")
        print("planted kernel ran; values:", np.frombuffer(buf.read(0, 16), np.float32))
    except Exception as e:  # the write may fault (a sticky error for this context)
        print("fault reported:", e)


if __name__ == "__main__":
    main()
