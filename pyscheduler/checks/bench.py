import click
bench = None
