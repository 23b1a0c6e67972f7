
4818Cancelled by bob