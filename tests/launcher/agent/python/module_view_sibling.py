# Imported by module_view.py after it changed directory: found through sys.path[0].
