"""The interpreter patches installed on a Triton they do not know, in a
process of its own (the patches are process-wide): the registry's version is
replaced by ``9.9.9``, then CPU mode's ``apply_after_import`` runs. Prints JSON:
each scenario's states, and what vLLM's slot-mapping kernel wrote.

    python tests/interp_registry_probe.py unknown   # no opt-in: every patch stays off
    python tests/interp_registry_probe.py force     # SIMRIG_INTERPRETER_PATCHES=force, start-up check passes
    python tests/interp_registry_probe.py fault     # forced, with a patch that changes what a store writes
"""

from __future__ import annotations

import json
import os
import sys


def main(scenario: str) -> None:
    from simrig.vllm_runtime import platform

    platform.configure(force_cpu=True)
    import vllm  # noqa: F401
    from triton.runtime import interpreter

    from simrig.triton_interpreter import patch_catalogue, registry
    from simrig.vllm_runtime import interpreter_patches

    from vllm.v1.worker.gpu import buffer_utils

    buffer_utils.is_uva_available = lambda: False  # as apply_after_import does first
    plain = interpreter_patches.slot_mapping_bytes()  # Triton's own plumbing: nothing installed yet
    registry.triton_version = lambda: "9.9.9"
    if scenario != "unknown":
        os.environ[registry.PATCHES_ENV] = "force"
    if scenario == "fault":
        builder = interpreter.interpreter_builder
        store = builder.create_masked_store

        def skewed_store(ptrs, value, mask, *rest, **kw):  # every stored value one higher
            value.data = value.data + 1
            return store(ptrs, value, mask, *rest, **kw)

        def install() -> bool:
            builder.create_masked_store = skewed_store
            return True

        # its own probe cannot see the fault (a constant): only the start-up check can
        faulty = registry.Patch("skewed_store", patch_catalogue.INTERP,
                                ("interpreter_builder.create_masked_store",),
                                install, lambda: 0, patch_catalogue.KNOWN_GOOD)
        listed = interpreter_patches.patches
        interpreter_patches.patches = lambda: [*listed(), faulty]
    platform.apply_after_import()
    after = interpreter_patches.slot_mapping_bytes()
    print(json.dumps({
        "states": [[s.name, s.state, s.reason] for s in registry.patch_states()],
        "summary": registry.summary()["line"],
        "same_as_plain": after == plain,
        "store_put_back": "create_masked_store" not in vars(interpreter.interpreter_builder),
        "launch_is_tritons": not hasattr(interpreter.GridExecutor.__call__, "__simrig_sampled__"),
        "np_dtype_is_tritons": not hasattr(interpreter._get_np_dtype, "__simrig_memo__"),
    }))


if __name__ == "__main__":
    main(sys.argv[1])
