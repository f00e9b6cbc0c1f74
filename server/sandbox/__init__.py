"""Docker confinement for agents' commands: the per-agent container, the engine seam, the image build."""
