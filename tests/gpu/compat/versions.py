"""compat.sh helper: versions of the frameworks, one `name=version` line each (no GPU use)."""
import importlib

for name in ("torch", "jax", "cupy"):
    try:
        mod = importlib.import_module(name)
        version = getattr(mod, "__version__", "?")
        if name == "torch":
            version += " (CUDA %s)" % mod.version.cuda
        elif name == "jax":
            try:
                import jaxlib
                version += " (jaxlib %s)" % jaxlib.__version__
            except Exception:  # noqa: BLE001
                pass
        elif name == "cupy":
            try:
                version += " (CUDA runtime %s)" % mod.cuda.runtime.runtimeGetVersion()
            except Exception:  # noqa: BLE001
                pass
    except Exception as e:  # noqa: BLE001
        version = "not importable (%s: %s)" % (type(e).__name__, str(e).splitlines()[0][:120] if str(e) else "")
    print("%s=%s" % (name, version), flush=True)
