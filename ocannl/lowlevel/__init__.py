"""The compiler half: tensor nodes, the assignments and loop IRs, lowering and passes.

Nothing here imports the tensor frontend (tensor.py, ops.py, train.py).
"""
