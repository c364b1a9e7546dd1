"""SGLang's `sglang.lang` package path, so that an SGLang program's `from sglang.lang.ir import
REGEX_INT` works when `sglang` is radixrt: `radixrt.lang.ir` (radixrt/lang/ir/) re-exports
radixrt.frontend.lang.sglang_ir, where the names live. Nothing else of SGLang's `sglang.lang` is
here: the DSL itself is radixrt's top-level API (`import radixrt as sgl`)."""
