"""llama.cpp's own endpoints: /infill (and completions' FIM `suffix`), /tokenize, /detokenize, its sampler chain."""
