"""Example agents beside the demo: code-first agents written with executor.sdk."""
