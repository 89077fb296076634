"""Atlas: placement, DC selection, multiple TCP connections, temporal WAN sharing."""
