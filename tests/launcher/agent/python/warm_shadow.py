"""The program's own copy of a module also installed (warm_site's warm_shadow.py): an exec'd
worker imports this one, from its script's folder, first on sys.path."""

WHERE = "script folder"
