"""The demos of `python -m einjit demo`: half moons, digits, their command-line helpers and the
small data sets they train on (`einjit.datasets`)."""
