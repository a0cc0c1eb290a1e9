"""Datasets (`datasets.py`), prompt and chat templates (`templates.py`), synthetic tasks."""
