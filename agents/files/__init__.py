"""Files: model files (plain JSON data + tensors in a zip, never unpickled) and run folders.
Imports no algorithm: the algorithm hands it plain data and parameters.
"""
