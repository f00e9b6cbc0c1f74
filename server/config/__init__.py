"""Team configuration.

The models (models.py), reading team files (loading.py), where teams come from (presets.py).
"""
