"""What a bundle is on disk and how it becomes running models: the manifest, the tokenizer, the
loader that builds sessions over KV pools, memory sizing, 2 MiB pages, and the genai config
other runtimes read."""
