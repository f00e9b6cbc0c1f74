"""Tests of coding-agent CLIs as team members."""
