"""Ring-aware radix-cache adapter for SGLang's UnifiedRadixCache / MambaPool."""
