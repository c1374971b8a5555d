import os
import sys

# Make the gym-sokoban reference helpers importable by the tests in this folder.
sys.path.insert(0, os.path.dirname(__file__))
