"""How a team converges: the pure protocol, its driver, one agent's turn, and the words agents see."""
