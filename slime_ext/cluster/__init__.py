"""Runs that span nodes: what Ray places for this project (eval servers), beside what slime places."""
