"""pycoral.learn.backprop on coralrt: a softmax regression last layer (module ``softmax_regression``)."""
