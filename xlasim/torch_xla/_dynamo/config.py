"""Switches of the dynamo bridge, as torch_xla 2.9 names them."""

# True: a compiled function does not look for inputs that still hold pending IR (cheaper; a
# pending input then fails).
skip_input_data_check = False
