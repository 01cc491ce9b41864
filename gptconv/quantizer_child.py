"""llama.cpp's quantizer (``llama_model_quantize``, the code behind ``llama-quantize``) in a process of
its own: ``python quantizer_child.py IN OUT FTYPE NTHREAD``, run by path so that it imports only
llama_cpp. Python runs signal handlers only between bytecodes, so a quantizer called in the exporting
process would hold off Ctrl-C and SIGTERM for the minutes a large model takes; as a child it is
killed at once and the export cleans up (``llamacpp.run_quantizer``).

Exit 0 when the file is written; otherwise non-zero with llama.cpp's reason on stderr: its first
error, else its last warning (as ``llamacpp._failed`` chooses; this file imports only llama_cpp).
"""

import ctypes
import sys


def main(path: str, out: str, ftype: str, nthread: str) -> int:
    import llama_cpp as lib
    said: dict[int, str] = {}
    warn, error = 3, 4  # ggml's log levels (ggml.h: NONE, DEBUG, INFO, WARN, ERROR, CONT); 2 is INFO

    @lib.llama_log_callback
    def keep(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
        line = text.decode("utf-8", "replace").strip()
        if line and (level == warn or level == error and error not in said):
            said[level] = line  # the first error is the cause, those after it say the quantizer failed

    lib.llama_log_set(keep, ctypes.c_void_p(0))
    lib.llama_backend_init()
    params = lib.llama_model_quantize_default_params()
    params.ftype = getattr(lib, f"LLAMA_FTYPE_{ftype}")
    params.allow_requantize = ftype == "ALL_F32"  # F32 from a quantized file: dequantizing
    params.nthread = int(nthread)
    params.max_buf_size = 256 << 20  # what it writes held at most this long: its default, 8 GiB, held a 1.3 GB F32 file whole
    if lib.llama_model_quantize(path.encode(), out.encode(), ctypes.byref(params)) != 0:
        print(said.get(error) or said.get(warn) or "llama.cpp gave no reason", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
