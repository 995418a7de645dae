"""The vector-env backends: ``make_vec`` (make_vec.py) builds one of them."""
