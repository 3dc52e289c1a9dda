from mathutil import is_even, square


def test_is_even():
    assert is_even(4) is True
    assert is_even(7) is False
    assert is_even(0) is True


def test_square_still_works():
    assert square(3) == 9
