"""How a team converges: the pure protocol, the orchestrator that drives it, turns and the words agents
see."""
