"""Prompt templates of the annotation phase (YAML package data, loaded by annotation.prompts)."""
