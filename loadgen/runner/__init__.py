"""The distributed open-loop runner: a Locust master and workers talking over Locust's messaging."""
