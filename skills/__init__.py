"""SKILL.md packs, shipped as package data (this file only makes the folder a package)."""
