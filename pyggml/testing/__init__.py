"""What pyggml's tests and benchmarks share and a runtime never needs: random-weight GGUF writers
(`synthetic`), llama.cpp's logits through llama-cpp-python (`llamacpp`) and the field's agreement measures
(`agreement`: teacher-forced KL divergence against llama.cpp's F32-weights yardstick)."""
