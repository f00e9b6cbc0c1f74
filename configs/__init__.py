"""Team presets in YAML, shipped as package data (this file only makes the folder a package)."""
